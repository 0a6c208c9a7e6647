"""The DataEngine function ``lineagefn`` on lineage-outbox; ``python -m function`` runs it
locally the way the platform does."""
