"""The dashboard's entry script: page setup, the shared sidebar, and navigation between the pages.

`streamlit run bebop/app/main.py` (what `bebop dashboard` does) or `streamlit run app/main.py` from a
clone. Pages are registered by absolute path, so they are found wherever bebop is installed.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from bebop.app import state

VIEWS = Path(__file__).resolve().parent / "views"  # not "pages/": Streamlit would auto-register that folder
REFRESH_S = 5  # seconds between the sidebar's looks for new runs and state changes (the Live page's choice when set)
# Selected runs show whole in the sidebar: Streamlit cuts a multiselect chip at a fixed width by default, and the box
# of chips at a fixed height (three wrapped run names fill it), scrolling the rest out of sight.
CHIPS_CSS = """<style>
section[data-testid="stSidebar"] [data-testid="stMultiSelect"] div { max-height: none; }
section[data-testid="stSidebar"] [data-testid="stMultiSelect"] span[data-tag] { max-width: 100%; height: auto; }
section[data-testid="stSidebar"] [data-testid="stMultiSelect"] span[data-tag] > span[title] { max-width: none;
  white-space: normal; overflow: visible; text-overflow: clip; overflow-wrap: anywhere; }
</style>"""


def _selection(root: Path, labels: dict) -> list[str]:
    """The selection to show under `root`: the user's, minus runs that left it (said once, in a warning), plus runs
    that appeared under it since the last look (a job started after the page opened is what the user came to watch),
    or the default one when the root is new to this session (a change of root is not a run going missing)."""
    chosen = st.session_state.get("runs_selected")
    seen_root, seen = st.session_state.get("runs_selected_root"), st.session_state.get("runs_seen")
    st.session_state["runs_selected_root"], st.session_state["runs_seen"] = str(root), list(labels)
    if chosen is None or seen_root not in (None, str(root)):
        return state.default_selection(list(labels.values()), labels)
    gone = [name for name in chosen if name not in labels]
    if gone:
        st.warning(f"No longer under the root (deleted or moved): {', '.join(gone)}", icon=":material/folder_off:")
    new = [name for name in labels if seen is not None and name not in seen and name not in chosen]
    return [name for name in chosen if name in labels] + new


def _watch(root: Path, states: dict[str, str]) -> None:
    """Rerun the whole app when a run appears under the root, leaves it or changes state: the sidebar, the selection
    and every page then show it (the Live page's panels refresh only themselves)."""
    _, infos, _ = state.discover(str(root))
    if {str(info.path): info.state for info in infos} != states:
        st.rerun()


def _summary(picked: list[str], labels: dict) -> str:
    """The selection's states in one line; runs named only where their state is not "finished"."""
    by_state: dict[str, list[str]] = {}
    for name in picked:
        by_state.setdefault(labels[name].state, []).append(name)
    parts = [f"{state.badge(state_name)} {len(names)}" + ("" if state_name == "finished" else f" ({', '.join(names)})")
             for state_name, names in by_state.items()]
    return f"{len(picked)} selected: " + " · ".join(parts)


def sidebar() -> None:
    """Runs root and run selection, shared by every page (stored for `state.selected()`)."""
    with st.sidebar:
        st.html(CHIPS_CSS)
        root_text = st.text_input("Runs root", value=state.default_root(), key="runs_root",
                                  help="Folder holding run directories (default ./runs or $BEBOP_RUNS)")
        root, infos, message = state.discover(root_text)
        labels = {state.label(info, root): info for info in infos}
        st.session_state["runs_selected"] = _selection(root, labels)
        picked = st.multiselect("Runs", options=list(labels), key="runs_selected", placeholder="Pick runs to show")
        if picked:
            st.caption(_summary(picked, labels))
        st.caption(message or f"{len(infos)} run(s) under `{root}`")
        paused = st.session_state.get("live_paused", False)
        every = None if paused else st.session_state.get("live_every", REFRESH_S)
        st.fragment(run_every=every)(_watch)(root, {str(info.path): info.state for info in infos})
    st.session_state["_bebop_ctx"] = (root, infos, [labels[name] for name in picked], message)


def main() -> None:
    st.set_page_config(page_title="bebop", page_icon=":material/speed:", layout="wide")
    pages = [
        st.Page(VIEWS / "runs.py", title="Runs", icon=":material/list:", default=True),
        st.Page(VIEWS / "live.py", title="Live", icon=":material/monitoring:", url_path="live"),
        st.Page(VIEWS / "speed.py", title="Speed", icon=":material/speed:", url_path="speed"),
        st.Page(VIEWS / "compare.py", title="Compare", icon=":material/compare_arrows:", url_path="compare"),
        st.Page(VIEWS / "shadow.py", title="Shadow heads", icon=":material/stacked_line_chart:", url_path="shadow"),
        st.Page(VIEWS / "samples.py", title="Samples", icon=":material/text_fields:", url_path="samples"),
        st.Page(VIEWS / "mtp.py", title="MTP heads", icon=":material/model_training:", url_path="mtp"),
        st.Page(VIEWS / "metrics.py", title="All metrics", icon=":material/query_stats:", url_path="metrics"),
    ]
    page = st.navigation(pages)
    sidebar()
    page.run()


if __name__ == "__main__":
    main()
