"""The end-to-end demo, ``python -m specops.demo`` (``cli.py``), with what only it needs: the text
its n-gram models learn from (``corpus.txt``, written by ``make_corpus.py``), p-values for its
lossless check (``stats.py``, which the tests use too) and a progress bar (``progress.py``).
Nothing in the library imports this package."""

from .cli import full_tree_parents, main, parse_args

__all__ = ["full_tree_parents", "main", "parse_args"]
