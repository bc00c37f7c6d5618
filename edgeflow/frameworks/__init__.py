"""The source frameworks besides PyTorch: loading, running and exporting their models."""
