"""The sub-quadratic attention families (LSH, Linformer, linear attention) on their shared
projections.
"""
