"""Your plugin: how aiayn-conformance builds your model (docs/plugins.md). The reference stands in for
your model here; ``aiayn scaffold my_package.model:Transformer -o my_plugin.py`` writes a first one for yours."""

from aiayn_conformance.implementations import Implementation, hookimpl
from aiayn_conformance.reference.model import Transformer


def build(config):
    """ModelConfig -> your model behind the adapter contract (spec/contract.py)."""
    return Transformer(config)


@hookimpl
def register_implementations(register):
    register(Implementation(name="mine", build=build, summary="my Transformer", source="my_plugin.py",
                            deviations={}))
