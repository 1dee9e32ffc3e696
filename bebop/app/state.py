"""What every dashboard page shares: the runs root, the selected runs, their incremental readers.

The sidebar (drawn by `main.py` before the page) stores its choice in `st.session_state`; pages call
`selected()` to get it and `load_runs()` to get up-to-date `Run`s. A `Run` is kept in the session and
only `refresh()`ed afterwards, so a page that redraws every few seconds reads only the bytes appended
since its last look. Problems a user can cause or meet (a missing root, a run deleted while open, a
corrupt line) become a warning on the page, never a traceback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from bebop import metrics, plots, speedup
from bebop.plots import row_depths as row_plots
from bebop.runlog import Run, RunInfo, list_runs, load_run
from bebop.runlog.setup import SETUP_KEYS, SYNTHETIC, head_of, is_synthetic, made_by, policy_of

DEFAULT_ROOT = "runs"
CONFIG_KEYS = SETUP_KEYS  # meta.json's setup keys, what every table shows about a run (docs/runs.md)
DEFAULT_SELECTION = 5
# Column titles on screen for the names the tables carry (the CSV downloads keep the names).
TITLES = {"run": "run", "state": "state", "kind": "kind", "step": "last step", "task": "task", "rollout": "rollout",
          "mtp_objective": "MTP loss", "mtp_strategy": "MTP strategy", "gamma": "γ", "mode": "mode",
          "steps": "steps", "accept_length": "accept length", "final_reward": "reward (last tenth)",
          "final_entropy": "entropy (last tenth)", "step_s": "s / step (median)",
          "slope": "slope (per nat)", "r2": "R²", "series": "series", "plain_run": "plain partner",
          "measured_end_to_end": "whole step, measured", "measured_rollout": "generation, measured",
          "measured_update": "update, measured", "response_ratio": "answer length (MTP / plain)",
          "tokens_per_s": "tokens / s (median)",
          "predicted": "generation, predicted", "tokens_per_row_step": "tokens / row-step",
          "step_cost": "step cost (plain steps)", "note": "note", "n": "points", "intercept": "intercept",
          "heartbeat_age_s": "heartbeat age", "created": "created", "message": "message", "policy": "policy",
          "head": "head", "warnings": "warnings", "flags": "what the points cannot support", "within": "within slope",
          "relative_change": "relative change", "strategy": "strategy", "points": "points", "start": "start",
          "end": "end"}
STATE_COLORS = {"running": "green", "finished": "blue", "failed": "red", "interrupted": "violet", "stale": "orange",
                "corrupt": "gray"}
_CACHE = "_bebop_runs"  # session key: {run path: Run}
_COLORS = "_bebop_colors"  # session key: {run label: colour}
MISSING = "—"  # what a table cell shows where a run has no such value


def default_root() -> str:
    return os.environ.get("BEBOP_RUNS") or DEFAULT_ROOT


def label(info: RunInfo, root: Path) -> str:
    """A run's name on screen: its path under the root (unique, unlike meta.json's name), marked when the run is
    synthetic, so the mark follows it into every table, legend and selection."""
    name = info.path.relative_to(root).as_posix()
    return f"{name} ({SYNTHETIC})" if is_synthetic(info.meta) else name


def shown(value: Any) -> Any:
    """A setup value for a table cell: a sweep's several values as one comma-separated string."""
    return ", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value


def is_plain(info: RunInfo) -> bool:
    """An RL run that decodes without MTP: the baseline every speedup is measured against."""
    return info.kind == "rl" and info.setup.get("rollout") == "none"


def speed_pairs(chosen: list[RunInfo], infos: list[RunInfo], root: Path) -> tuple[dict[str, RunInfo], dict[str, str]]:
    """Each selected MTP run's plain partner, a run with the same workload (`bebop.speedup.differences`): one of the
    selection, else one in the same folder, else the newest under the root. ({MTP label: partner}, {MTP label: why
    it has none}); a run without a partner gets no speedup."""
    picked = {info.path for info in chosen}
    plains = [info for info in infos if is_plain(info)]
    pairs, unpaired = {}, {}
    for info in chosen:
        if info.kind != "rl" or is_plain(info):
            continue
        order = sorted(plains, key=lambda p: (p.path not in picked, p.path.parent != info.path.parent))
        gaps = {label(p, root): speedup.differences(p.meta, info.meta) for p in order}
        found = next((p for p in order if not gaps[label(p, root)]), None)
        if found is not None:
            pairs[label(info, root)] = found
        elif not order:
            unpaired[label(info, root)] = "no run under the root decodes plainly"
        else:
            closest = min(gaps, key=lambda name: len(gaps[name]))
            ours, theirs = speedup.workload(info.meta), speedup.workload(next(p.meta for p in order
                                                                               if label(p, root) == closest))
            unpaired[label(info, root)] = (
                f"no plain-decoding run has its workload; the closest, `{closest}`, differs in "
                + ", ".join(f"{speedup.WORKLOAD[key]} ({ours[key]} vs {theirs[key]})" for key in gaps[closest]))
    return pairs, unpaired


def default_selection(infos: list[RunInfo], labels: Mapping[str, RunInfo]) -> list[str]:
    """First visit: running runs first, then the newest, a handful in all, and always a no-MTP baseline
    when the root has one (without it every speedup would read against an MTP run). Synthetic runs only where the
    root holds no real run: a simulation is never shown beside a measurement unless a user picks it."""
    real = [name for name in labels if not is_synthetic(labels[name].meta)]
    names = real or list(labels)
    running = [name for name in names if labels[name].state == "running"]
    chosen = (running + [name for name in names if name not in running])[:DEFAULT_SELECTION]
    plain = [name for name in names if is_plain(labels[name])]
    if plain and not any(name in plain for name in chosen):
        chosen = chosen[: DEFAULT_SELECTION - 1] + plain[:1]
    return chosen


def discover(root_text: str) -> tuple[Path, list[RunInfo], str | None]:
    """The runs under `root_text`, or a message saying why there are none."""
    root = Path(root_text).expanduser()
    try:
        infos = list_runs(root)
    except FileNotFoundError:
        return root, [], f"The runs root `{root}` does not exist yet. Start a run (`bebop demo`) or point the sidebar at another folder."
    except OSError as err:
        return root, [], f"Cannot read the runs root `{root}`: {err}"
    if not infos:
        return root, [], (f"No runs under `{root}` yet. Start one with `bebop demo`, or write preview runs with "
                          f"`bebop preview {root}/preview`.")
    return root, infos, None


def selected() -> tuple[Path, list[RunInfo], list[RunInfo], str | None]:
    """(root, all runs, selected runs, message) as the sidebar left them for this script run."""
    ctx = st.session_state.get("_bebop_ctx")
    if ctx is None:  # a page run on its own (tests): discover with the defaults
        root, infos, message = discover(default_root())
        labels = {label(info, root): info for info in infos}
        return root, infos, [labels[name] for name in default_selection(infos, labels)], message
    return ctx


def open_page(title_text: str, hint: str) -> dict[str, Run]:
    """A page's opening: its title (marked when a run it shows is synthetic), then the selected runs loaded, by label;
    with none selected, the root's message or `hint`, and the page stops there."""
    root, _, chosen, message = selected()
    title(title_text, chosen)
    if not chosen:
        st.info(message or hint, icon=":material/info:")
        st.stop()
    return load_runs(chosen, root)


def load_runs(infos: list[RunInfo], root: Path, *, notify: bool = True) -> dict[str, Run]:
    """Up-to-date `Run`s for `infos`, by label; runs that vanished or broke are left out (and reported)."""
    cache: dict[str, Run] = st.session_state.setdefault(_CACHE, {})
    runs: dict[str, Run] = {}
    for info in infos:
        key, name = str(info.path), label(info, root)
        try:
            run = cache.get(key)
            if run is None:
                cache[key] = run = load_run(info.path)
            else:
                run.refresh()
        except FileNotFoundError:
            cache.pop(key, None)
            if notify:
                st.warning(f"Run `{name}` was deleted or moved while open; it is no longer shown.",
                           icon=":material/folder_off:")
            continue
        except (OSError, ValueError) as err:
            cache.pop(key, None)
            if notify:
                st.warning(f"Run `{name}` cannot be read right now: {err}", icon=":material/error:")
            continue
        if run.skipped_lines and notify:
            st.warning(f"Run `{name}`: skipped {run.skipped_lines} corrupt line(s) in its streams.", icon=":material/warning:")
        runs[name] = run
    return runs


def trains(runs: Mapping[str, Run], *, notify: bool = True) -> dict[str, pd.DataFrame]:
    """The non-empty train streams by run label; runs with no data at all yet get one info line."""
    out, empty = {}, []
    for name, run in runs.items():
        train = run.streams.get("train")
        if train is not None and not train.empty and "step" in train.columns:
            out[name] = train
        elif not any(len(stream) for stream in run.streams.values()):  # an eval run has only `tokens`
            empty.append(name)
    if empty and notify:
        st.info(f"No data logged yet in: {', '.join(f'`{n}`' for n in empty)}.", icon=":material/hourglass_empty:")
    return out


def entropy_points(runs: Mapping[str, Run], *, by: str = "step") -> tuple[pd.DataFrame, str]:
    """Entropy-law points and their y-axis title, for RL runs (train counters) and evaluation runs.

    Per step the y axis is the accept length, so evaluation runs (per-token `tokens` streams, whose y is an
    acceptance rate) join only when no RL run has points; per entropy bin both are acceptance rates.
    """
    parts = [plots.entropy_points(trains(runs, notify=False), by=by)]
    if by == "step" and not parts[0].empty:
        return parts[0], "accept length (tokens / verify step)"
    covered = set(parts[0]["run"])
    parts.append(eval_points({name: run for name, run in runs.items() if name not in covered}))
    parts = [p for p in parts if not p.empty] or parts[:1]
    return pd.concat(parts, ignore_index=True), "acceptance rate (accepted / reached drafts)"


LAW_VIEWS = {"step": "per RL step", "bin": "per entropy bin"}


def law_fits(runs: Mapping[str, Run]) -> dict[str, pd.DataFrame]:
    """The entropy law's fits in both views ({view: `plots.entropy_fits`}), to say which the data support."""
    return {view: plots.entropy_fits(entropy_points(runs, by=view)[0]) for view in LAW_VIEWS}


def better_law_view(runs: Mapping[str, Run]) -> str:
    """The view whose fits explain more (the higher median R² over the runs; per step when neither fits yet)."""
    r2 = {view: fits["r2"].dropna().median() for view, fits in law_fits(runs).items()}
    return "bin" if r2["bin"] > r2["step"] or (pd.isna(r2["step"]) and not pd.isna(r2["bin"])) else "step"


def law_views_caption(runs: Mapping[str, Run], shown_view: str) -> str:
    """How well the law fits in each view (R² range and points per fit), so the view shown is a reasoned choice."""
    parts = []
    for view, fits in law_fits(runs).items():
        fitted = fits.dropna(subset=["r2"])
        if fitted.empty:
            parts.append(f"{LAW_VIEWS[view]}: too few points to fit")
            continue
        r2 = f"{fitted['r2'].min():.2f}" + (f"–{fitted['r2'].max():.2f}" if len(fitted) > 1 else "")
        n = f"{fitted['n'].min()}" + (f"–{fitted['n'].max()}" if fitted["n"].nunique() > 1 else "")
        parts.append(f"{LAW_VIEWS[view]}: R² {r2} over {n} points")
    return f"Fitted lines, {'; '.join(parts)}. Shown: {LAW_VIEWS[shown_view]}."


def eval_points(runs: Mapping[str, Run]) -> pd.DataFrame:
    """The per-token entropy law of evaluation runs (their `tokens` streams), one series per (head, method)."""
    parts = [plots.token_points({name: run.streams["tokens"]},
                                run.meta.get("entropy_bin_edges") or metrics.ENTROPY_BIN_EDGES)
             for name, run in runs.items() if "tokens" in run.streams]
    return pd.concat(parts, ignore_index=True) if parts else plots.token_points({})


def runs_table(infos: list[RunInfo], root: Path, warnings: Mapping[str, int] | None = None) -> pd.DataFrame:
    """One row per run for the Runs page (and its CSV); `warnings`: each run's count as shown (default: stored)."""
    now = time.time()
    rows = []
    for info in infos:
        row = {"run": label(info, root), "state": info.state,
               "kind": info.kind + (f" ({SYNTHETIC})" if is_synthetic(info.meta) else ""), "step": info.step,
               "policy": policy_of(info.meta), "head": head_of(info.meta),
               "warnings": (warnings or {}).get(label(info, root), len(info.warnings)) or None}
        row.update({key: shown(info.setup.get(key)) for key in CONFIG_KEYS})
        row["created"] = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created)) if info.created else None
        # Only a run still writing has a heartbeat worth reading; a finished run's age only says when it ended.
        live = info.state in ("running", "stale")
        row["heartbeat_age_s"] = round(now - info.heartbeat, 1) if info.heartbeat and live else None
        row["message"] = info.message
        rows.append(row)
    return pd.DataFrame(rows)


def note_made_by(named: Mapping[str, Mapping]) -> None:
    """Which policy and head made each run ({label: meta.json}), one line per distinct pair: a SmolLM2 run never
    passes for a tiny-model run."""
    lines: dict[str, list[str]] = {}
    _, names = one_folder(named)  # the demo's runs by their own names, as the tables below name them
    for name, meta in zip(names, named.values()):
        lines.setdefault(made_by(meta), []).append(name)
    for text, names in lines.items():
        st.caption(f":material/memory: {', '.join(f'`{n}`' for n in names)}: {text}")


def spec_gaps(trains: Mapping[str, pd.DataFrame]) -> dict[str, list[str]]:
    """Runs that log some speculative counters but not all that pooling needs: {run: missing fields}."""
    gaps = {name: plots.missing_spec(train) for name, train in trains.items()}
    return {name: missing for name, missing in gaps.items() if 0 < len(missing) < len(plots.SPEC_FIELDS)}


def note_spec_gaps(trains: Mapping[str, pd.DataFrame]) -> None:
    """One line per partial run: what cannot be drawn, and which field its records lack."""
    for name, missing in spec_gaps(trains).items():
        st.caption(f":material/info: `{name}`: acceptance is not shown; its train records lack "
                   f"{', '.join(f'`{m}`' for m in missing)}.")


def run_colors(names: Iterable[str]) -> dict[str, str]:
    """Each run's colour for the whole session: given when the run is first shown (a palette colour none of the
    other runs shown with it has, while the palette lasts) and never changed after, so a run keeps its colour
    whichever runs join or leave the selection."""
    given: dict[str, str] = st.session_state.setdefault(_COLORS, {})
    names = list(dict.fromkeys(names))
    for name in names:
        if name not in given:
            taken = [given[other] for other in names if other in given]
            given[name] = min(plots.PALETTE, key=lambda color: (taken.count(color), plots.PALETTE.index(color)))
    return {name: given[name] for name in names}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def one_folder(labels: Iterable[Any]) -> tuple[str, list[str]]:
    """(their folder, the runs' names within it) for run labels all in one folder (the demo's four), else ("", the
    labels)."""
    labels = [str(label) for label in labels]
    folders = {label.rpartition("/")[0] for label in labels}
    if len(folders) == 1 and (folder := folders.pop()):
        return folder, [label.rpartition("/")[2] for label in labels]
    return "", labels


def show_table(table: pd.DataFrame, formats: Mapping[str, str] | None = None,
               helps: Mapping[str, str] | None = None) -> None:
    """A table as users read it: readable titles, numbers formatted (`formats`: printf patterns by column, else 4
    significant digits), and "—" where a run has no value, never None or nan. A column with gaps or mixed types
    (γ: 3 and "auto", which Arrow cannot serialise as one) is shown as text, right-aligned where it holds numbers."""
    table, config = table.reset_index(drop=True), {}
    if "run" in table.columns:  # runs of one folder (the demo's four): its name once, above, and the table fits
        folder, names = one_folder(table["run"])
        if folder:
            st.caption(f"Runs in `{folder}/`")
            table["run"] = names
    for column in table.columns:
        values, title, help_text = table[column], TITLES.get(column, column), (helps or {}).get(column)
        present = [v for v in values if not _missing(v)]
        numeric = bool(present) and all(is_number(v) for v in present)
        pattern = (formats or {}).get(column) or ("%.4g" if numeric and any(isinstance(v, float) for v in present)
                                                   else None)
        if len(present) < len(values) or len({type(v) for v in present}) > 1 and not numeric:
            table[column] = [MISSING if _missing(v) else pattern % v if pattern and numeric else str(v) for v in values]
            config[column] = st.column_config.TextColumn(title, help=help_text, alignment="right" if numeric else None)
        elif numeric:
            config[column] = st.column_config.NumberColumn(title, help=help_text, format=pattern)
        else:
            config[column] = st.column_config.Column(title, help=help_text)
    st.dataframe(table, hide_index=True, width="stretch", column_config=config)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, (float, np.floating)) and np.isnan(value))


def download(data: pd.DataFrame, file_name: str, key: str) -> None:
    """A CSV download of a chart's data (full resolution, not the thinned points on screen)."""
    st.download_button("CSV", data.to_csv(index=False), file_name=file_name, mime="text/csv", key=key,
                       on_click="ignore", icon=":material/download:", help="Download this chart's data")


def title(text: str, chosen: Iterable[RunInfo]) -> None:
    """A page's title, marked when any run it shows is synthetic (with what that means, once, below it)."""
    synthetic = [info for info in chosen if is_synthetic(info.meta)]
    st.title(text + (f" :orange-badge[{SYNTHETIC} runs shown]" if synthetic else ""))
    if synthetic:
        st.caption(f":material/science: {len(synthetic)} of the runs shown are {SYNTHETIC}: simulated by `bebop "
                   "preview` to show what the pages draw; their numbers measure nothing.")


def badge(state_name: str) -> str:
    """A run state as a coloured Markdown badge."""
    return f":{STATE_COLORS.get(state_name, 'gray')}-badge[{state_name}]"


def show_row_depths(trains: Mapping[str, pd.DataFrame], colors: Mapping[str, str], page: str,
                    title: str | None = None) -> None:
    """gamma="rows" (bebop.engine.depth.rows): each row's depth per RL step beside the verify-token budget, each over
    its data's download; nothing where no run has them. `page` prefixes the widgets' keys."""
    depths = row_plots.row_depths(trains)
    if depths.empty:
        return
    if title:
        st.subheader(title)
    budget = row_plots.budgets(trains)
    left, right = st.columns(2)
    for column, figure, data, name in ((left, row_plots.row_depth_figure(depths, colors=colors), depths, "row_depths"),
                                       (right, row_plots.budget_figure(budget, colors=colors), budget, "budget")):
        with column:
            st.plotly_chart(figure, key=f"{page}_{name}")
            download(data, f"{name}.csv", key=f"dl_{page}_{name}")
