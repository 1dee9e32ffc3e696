"""The live dashboard (Streamlit): `bebop dashboard`, or `streamlit run app/main.py` from a clone.

It lives inside the package so a pip-installed bebop can serve it; the repository's `app/main.py` is a
thin entry point onto `bebop/app/main.py`. Pages (one file each under `views/`) read runs only through
`bebop.runlog` and draw only with `bebop.plots`; they never write into a run directory.
"""
