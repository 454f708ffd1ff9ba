"""The Streamlit explorer: ``streamlit run app/main.py`` (``make app``).

Pages live in ``app/views/`` (one question each), figures in ``plots`` (shared with the report and the
tutorials) and ``app/theory_figures.py``; every number comes from ``cancellation``, ``toymodel`` or ``instruments``.
"""
