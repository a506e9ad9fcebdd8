"""Small, self-contained examples; ``python -m gpvi.examples`` runs the quick-start fit."""
