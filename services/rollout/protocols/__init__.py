"""HTTP request bodies <-> engine sequences, one module per API: ``openai`` (``/v1/completions``,
``/v1/chat/completions``), ``sglang`` (``/generate``), ``tokens`` (token in / token out). No FastAPI here: the
routes (``routes/``) call these and map the results to responses."""
