"""The stage engine: stage declarations, the content-addressed cache and the pipeline runner."""
