"""GEM environments (PyPI ``gem-llm``) in tidal: ``envs.make("gem:game:GuessTheNumber-v0-easy")``.

A GEM environment already speaks tidal's single-agent interface, so it runs unchanged: ``make`` seats it
as a one-player game (``envs.single_agent``) and the env actor hosts it like any other. GEM's observation
wrappers can be named in ``wrappers`` (e.g. ``"concat"``: each prompt holds the whole episode so far, which a
multi-turn GEM game needs, since its ``step`` observation says only what the last guess did).
"""

from __future__ import annotations


def make_gem(env_id: str, wrappers: str = "", **kwargs):
    """``gem.make(env_id, **kwargs)``, wrapped by GEM's own ``wrappers`` (comma-separated names)."""
    try:
        import gem
        from gem.envs.registration import ENV_REGISTRY
        from gem.wrappers.wrapper_factory import get_wrapper_fns
    except ImportError as error:
        raise ImportError(f"gem:{env_id} needs GEM: pip install gem-llm==0.1.0 ({error})") from None
    if env_id not in ENV_REGISTRY:
        close = [name for name in ENV_REGISTRY if env_id.split("-")[0] in name][:5]
        raise ValueError(f"unknown GEM environment {env_id!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))
    env = gem.make(env_id, **kwargs)
    for wrap in get_wrapper_fns(wrappers) if wrappers else []:
        env = wrap(env)
    return env
