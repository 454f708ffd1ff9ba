"""The Streamlit explorer: ``streamlit run app/main.py`` (``make app``).

Pages live in ``app/views/`` (one question each), figures in ``app/figures.py`` and
``app/theory_figures.py``; every number comes from ``toymodel`` or ``cancellation``.
"""
