"""What the tests share, in one importable place (``tests/`` is on ``sys.path``:
``pythonpath`` in pyproject.toml): ``from support.scenarios import tiny``. No test module
imports another (tests/project/test_architecture.py checks that); helpers that plugin
authors need too (comparing records, stopping a run the way a kill would) are public in
:mod:`mecsim.testing`.

- :mod:`support.paths`: the repository's and the tests' folders;
- :mod:`support.scenarios`: the tiny scenario most tests build on;
- :mod:`support.helpers`: resuming, killing, op-trace and record helpers;
- :mod:`support.service`: a real ``mecsim serve`` in a subprocess, and its client;
- :mod:`support.cluster`: a real local Ray cluster of ``ray start`` processes;
- :mod:`support.venv`: a throwaway venv that plugin packages are installed into;
- :mod:`support.flower_sim`, :mod:`support.bad_input_corpus`: scripts as well as modules.
"""
