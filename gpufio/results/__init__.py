"""Results: the document, the one renderer, live progress, loading, compare, check,
--repeat and plots."""
