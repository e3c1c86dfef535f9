"""The IMDB ablation is defined once (`pipelines.imdb_ablation`): the model card shows its rendered table."""

import pathlib

from pipelines import imdb_ablation

MODEL_CARD = pathlib.Path(__file__).resolve().parents[1] / "docs" / "models" / "imdb_classifier.md"


def test_markdown_table_has_the_header_and_one_line_per_row():
    lines = imdb_ablation.markdown_table().splitlines()
    assert lines[0] == "| " + " | ".join(imdb_ablation.HEADER) + " |"
    assert len(lines) == len(imdb_ablation.ROWS) + 2
    for line, row in zip(lines[2:], imdb_ablation.ROWS, strict=True):
        assert line.strip("| ").split(" | ") == list(imdb_ablation.cells(row))


def test_the_model_card_shows_the_modules_table():
    table = imdb_ablation.markdown_table()
    assert table in MODEL_CARD.read_text(encoding="utf-8"), (
        f"{MODEL_CARD.name}'s ablation table is rendered from pipelines.imdb_ablation; it should read:\n{table}"
    )
