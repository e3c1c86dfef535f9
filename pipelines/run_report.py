"""Pieces of the run reports (`pipelines.imdb_report`, `pipelines.translator_report`): tables,
inline images and learning curves from the CSV training history. matplotlib is imported on use."""

import html


def table_html(rows, header=("", "")):
    """A table of `rows` (tuples as long as `header`); each row's first cell is its heading."""

    def row_html(row):
        name, *values = (html.escape(str(cell)) for cell in row)
        return f"<tr><th>{name}</th>" + "".join(f"<td>{value}</td>" for value in values) + "</tr>"

    heading = "".join(f"<th>{html.escape(title)}</th>" for title in header)
    return f"<table><tr>{heading}</tr>{''.join(row_html(row) for row in rows)}</table>"


def image_html(uri, alt):
    return f'<p><img alt="{html.escape(alt)}" src="{uri}"></p>'


def learning_curves_figure(history):
    """Loss and accuracy per epoch from the CSV history rows (training solid, validation dashed)."""
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, 2, figsize=(11, 4), layout="constrained")
    epochs = [int(row["epoch"]) + 1 for row in history]
    for ax, kind in zip(axes, ("loss", "accuracy")):
        for name in sorted(k for k in history[0] if k.endswith(kind) and not k.startswith("val_")):
            line = ax.plot(epochs, [row[name] for row in history], marker="o", label=name)[0]
            if f"val_{name}" in history[0]:
                ax.plot(
                    epochs,
                    [row[f"val_{name}"] for row in history],
                    "--",
                    marker="o",
                    color=line.get_color(),
                    label=f"val_{name}",
                )
        ax.set_xlabel("epoch")
        ax.set_title(kind)
        ax.legend(fontsize=7)
    return figure
