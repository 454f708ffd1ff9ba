"""Helpers every page uses: the page header and turning user errors into on-page messages."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st
import torch

# The toy's tensors have a few dozen elements: intra-op threads only add overhead (and on a loaded
# 2-core machine, a lot of it), so the app runs torch on one thread.
torch.set_num_threads(1)


def page_header(title: str, question: str, equation: str | None = None, source: str | None = None) -> None:
    """Title, the one question the page answers, and the paper's equation it is about (LaTeX)."""
    st.title(title)
    st.markdown(f"**{question}**")
    if equation:
        st.latex(equation)
    if source:
        st.caption(source)


@contextmanager
def user_errors() -> Iterator[None]:
    """Show a ValueError/TypeError raised by the library as a clear message and stop the page run.

    Library functions validate their inputs and raise with a message that names what to fix, so the
    page shows that message instead of a traceback.
    """
    try:
        yield
    except (ValueError, TypeError) as exc:
        st.error(f"{exc}")
        st.stop()
