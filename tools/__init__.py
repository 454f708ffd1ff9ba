"""Project tooling that is neither a study nor part of the library: ``machines`` (the environment variables
that make this CPU run another CPU's kernels, used by ``tests/machines.py``) and ``first_hour`` (the
README's first hour measured on three instruction sets, ``python -m tools.first_hour`` writes
docs/first-hour.md)."""
