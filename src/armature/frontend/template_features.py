"""What a Jinja chat template renders, read from its syntax tree: whether it takes the
request's `tools` and whether it writes the `tool_calls` of assistant messages. A template
that does neither would drop them silently, so the frontend refuses those requests."""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import TemplateSyntaxError, meta, nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["TemplateFeatures", "read_template_features"]


@dataclass(frozen=True)
class TemplateFeatures:
    takes_tools: bool = False
    renders_tool_calls: bool = False
    # the template names the developer role ('developer' as a string); one that does not
    # gets developer messages as system messages (OpenAI's developer replaces system)
    knows_developer: bool = False
    # the variables the template reads that nothing defines in it (request variables among)
    variables: frozenset[str] = frozenset()


def read_template_features(sources: list[str]) -> TemplateFeatures:
    """The features of a template given as one or more sources (a tokenizer may carry named
    templates, and picks the one for tools itself): a feature any source has. A source
    Jinja cannot parse has none (transformers could not render it either)."""
    # transformers renders with this environment and the loop-controls extension
    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    takes_tools = renders_tool_calls = knows_developer = False
    variables: set[str] = set()
    for source in sources:
        try:
            tree = env.parse(source)
        except TemplateSyntaxError:
            continue
        read = meta.find_undeclared_variables(tree)
        variables |= read
        takes_tools |= "tools" in read
        renders_tool_calls |= _mentions(tree, "tool_calls")
        knows_developer |= any(node.value == "developer" for node in tree.find_all(nodes.Const))
    return TemplateFeatures(takes_tools, renders_tool_calls, knows_developer, frozenset(variables))


def _mentions(tree: nodes.Template, name: str) -> bool:
    """`x.name`, `x['name']` or `x.get('name')` anywhere in the template."""
    for node in tree.find_all((nodes.Getattr, nodes.Const)):
        if isinstance(node, nodes.Getattr) and node.attr == name:
            return True
        if isinstance(node, nodes.Const) and node.value == name:
            return True
    return False
