"""The IMDB ablation is defined once (`pipelines.imdb_ablation`): the README shows exactly its table."""

import pathlib

from pipelines import imdb_ablation

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_ablation_table_is_the_modules():
    table = imdb_ablation.markdown_table()
    assert table.count("\n") == len(imdb_ablation.ROWS) + 2
    assert table in README.read_text(), f"README.md's IMDB ablation table should read:\n{table}"
