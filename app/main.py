"""`streamlit run app/main.py`: the README's dashboard command from a clone of the repository.

The dashboard itself lives in `bebop/app/` so that a pip-installed bebop ships it (`bebop dashboard`);
this file only makes a fresh clone work without `pip install -e .` and hands over.
"""

import sys
from pathlib import Path

try:
    from bebop.app.main import main
except ModuleNotFoundError:  # a clone that was never installed: import bebop from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bebop.app.main import main

main()
