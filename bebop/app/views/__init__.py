"""Dashboard pages. Each file is a Streamlit page script registered by `bebop/app/main.py`, not a module to import."""
