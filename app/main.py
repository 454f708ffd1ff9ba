"""Cancellation Lab explorer: ``streamlit run app/main.py`` (or ``make app``).

One page per question; inputs in the sidebar; every number computed by ``toymodel``/``cancellation``.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

VIEWS = Path(__file__).parent / "views"

PAGES = [
    st.Page(VIEWS / "shared_prefix.py", title="Shared prefix", icon=":material/account_tree:", default=True),
    st.Page(VIEWS / "clip_asymmetry.py", title="Clipping asymmetry", icon=":material/compare_arrows:"),
    st.Page(VIEWS / "transforms.py", title="Group transforms", icon=":material/transform:"),
    st.Page(VIEWS / "training_lab.py", title="Training lab", icon=":material/science:"),
    st.Page(VIEWS / "low_prob.py", title="Low-probability tokens", icon=":material/trending_down:"),
    st.Page(VIEWS / "token_coupling.py", title="Token coupling", icon=":material/hub:"),
    st.Page(VIEWS / "runs.py", title="Runs", icon=":material/monitoring:"),
    st.Page(VIEWS / "about.py", title="About / glossary", icon=":material/menu_book:"),
]

st.set_page_config(page_title="Cancellation Lab", page_icon=":material/functions:", layout="wide")
st.navigation(PAGES).run()
