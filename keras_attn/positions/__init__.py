"""Position encodings and embeddings, and the position biases (ALiBi, T5's relative bias)."""
