"""A verifiers taskset (``pip install verifiers``): arithmetic with a calculator tool.

verifiers ships no environment that runs offline (its tasksets need containers or
other packages), so this one is written against its documented API (``vf-init``'s
shape): typed tasks with an ``answer``, an MCP toolset, a ``@vf.reward``. The package
name is the taskset's id: ``CalcConfig(id="vf_calc")``.
"""

from vf_calc.taskset import CalcConfig, CalcTaskset

__all__ = ["CalcTaskset", "CalcConfig"]
