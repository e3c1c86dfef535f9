"""Look at attention: collect the weights of a model's keras_attn attention layers and draw them.

`attention_weights` needs only Keras; the figures (`plot_head`, `plot_heads`, `plot_model`) import
matplotlib when called (`pip install "keras-attn[viz]"`); `explorer_html` writes a
self-contained page (inline script and data, no network) with layer and head selectors.
The core library never imports this package.
"""

from keras_attn.visualization.capture import AttentionCapture
from keras_attn.visualization.capture import attention_weights
from keras_attn.visualization.explorer import explorer_html
from keras_attn.visualization.explorer import token_highlight_html
from keras_attn.visualization.explorer import write_explorer
from keras_attn.visualization.maps import AttentionMap
from keras_attn.visualization.maps import attention_maps
from keras_attn.visualization.maps import focus
from keras_attn.visualization.plots import figure_data_uri
from keras_attn.visualization.plots import plot_head
from keras_attn.visualization.plots import plot_heads
from keras_attn.visualization.plots import plot_model
from keras_attn.visualization.plots import save_figure

__all__ = [
    "AttentionCapture",
    "AttentionMap",
    "attention_maps",
    "attention_weights",
    "explorer_html",
    "figure_data_uri",
    "focus",
    "plot_head",
    "plot_heads",
    "plot_model",
    "save_figure",
    "token_highlight_html",
    "write_explorer",
]
