"""Print the pinned requirements of pyproject.toml, one per line.

`make` installs the project's dependencies from this list rather than
installing the project itself: the repository is run from its checkout
(`python -m brokerd`, `manage.py`), like any Django site.
Usage: python build/requirements.py [EXTRA ...]
"""

import pathlib
import sys
import tomllib

project = tomllib.loads((pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text())["project"]
reqs = list(project["dependencies"])
for extra in sys.argv[1:]:
    reqs += project["optional-dependencies"][extra]
print("\n".join(reqs))
