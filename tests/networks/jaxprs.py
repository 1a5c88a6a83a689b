"""Walking a jaxpr with the jaxprs nested in its equations (scan, cond, remat, custom_jvp,
custom_vmap bodies)."""


def all_equations(jaxpr):
    """The equations of ``jaxpr`` and, after each, those of every jaxpr nested in its params."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(item, "jaxpr", item)
                if hasattr(inner, "eqns"):
                    yield from all_equations(inner)
