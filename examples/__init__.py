"""Services the documentation builds step by step, each a runnable package
(``python -m examples.notes``: the tutorial's, ``docs/tutorial/``)."""
