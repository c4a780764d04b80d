"""A griffe extension for the API reference: the constructor of every dataclass and NamedTuple.

Modules become dataclasses when their class is created, and a ready-made layer takes its
fields from its Flax layer then (`NativeLayer`): static analysis sees neither. For each
class of `lift` and `linen_ext` that is a dataclass or a NamedTuple once imported, this
gives griffe an ``__init__`` with the runtime signature, which the reference shows as the
class's signature (``merge_init_into_class``), and puts a ``Fields:`` table before the
class's examples. A field's type and default are spelled as its source writes them (ours,
or the Flax layer's for the fields taken from it); its line is the first of: the entry of
an ``Attributes:`` section (the class's, a base's, the Flax layer's, another Flax
layer's), the field's own docstring, `FLAX_FIELD_LINES` (fields Flax leaves undocumented).
An entry of the class's own ``Attributes:`` section moves to the table. Mentions of a
class Flax's API reference documents (`flax.linen.Dense`) link to Flax's page, and a class
of `linen_ext` exported under such a name links it if its docstring does not. A default
that names a constant of ours holding a literal (``remat=REMATS``) is shown as that literal
(``remat=('none', 'dots', ...)``): the reader sees what it holds.

mkdocs.yml loads it (``extensions:`` of the python handler of mkdocstrings).
"""
import ast
import dataclasses
import functools
import importlib
import inspect
import os
import re
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import griffe

# The build imports the packages; no accelerator is needed to read a class.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')

PACKAGES = ('lift', 'linen_ext')
FLAX_API = 'https://flax.readthedocs.io/en/latest/api_reference/flax.linen/'
# The classes and transforms of Flax's API reference (docs/api_reference/flax.linen/*.rst
# in Flax's repository), by page; each one's anchor is its path, ``#flax.linen.Dense``.
FLAX_PAGES = {
    'layers': ('Dense DenseGeneral Conv ConvTranspose ConvLocal Einsum Embed BatchNorm '
               'LayerNorm GroupNorm RMSNorm InstanceNorm SpectralNorm WeightNorm Sequential '
               'Dropout MultiHeadDotProductAttention MultiHeadAttention SelfAttention '
               'RNNCellBase LSTMCell OptimizedLSTMCell ConvLSTMCell SimpleCell GRUCell '
               'MGUCell RNN Bidirectional'),
    'module': 'Module',
    'variable': 'Variable',
    'transformations': 'vmap scan jit remat remat_scan map_variables jvp vjp custom_vjp '
                       'while_loop cond switch',
}
FLAX_URLS = {name: f'{FLAX_API}{page}.html#flax.linen.{name}'
             for page, names in FLAX_PAGES.items() for name in names.split()}
FLAX_URLS['PReLU'] = f'{FLAX_API}activation_functions.html#flax.linen.activation.PReLU'
# `flax.linen.Dense` (or `flax.linen.activation.PReLU`) as a code span, not yet a link.
FLAX_MENTION = re.compile(r'(?<![\[`])`flax\.linen\.(?:\w+\.)*(\w+)`(?![`\]])')
DOCUMENTED = (griffe.DocstringSectionKind.attributes, griffe.DocstringSectionKind.parameters)
_PRODUCT = ('a Module class whose instance, made in each call, computes the {} in place of '
            '`{}` (e.g. `Fp8DotGeneralOp`).')
# Lines for the fields of Flax's layers that no Flax docstring describes.
FLAX_FIELD_LINES = {
    'dot_general': 'the function computing the product in place of `lax.dot_general`.',
    'dot_general_cls': _PRODUCT.format('product', 'dot_general'),
    'qkv_dot_general': 'the `dot_general` of the query, key and value projections.',
    'qkv_dot_general_cls': _PRODUCT.format('projections', 'qkv_dot_general'),
    'out_dot_general': 'the `dot_general` of the output projection.',
    'out_dot_general_cls': _PRODUCT.format('output projection', 'out_dot_general'),
    'conv_general_dilated': ('the function computing the convolution in place of '
                             '`lax.conv_general_dilated`.'),
    'conv_general_dilated_cls': _PRODUCT.format('convolution', 'conv_general_dilated'),
    'preferred_element_type': ("the dtype of the product's result, as `jnp.einsum` and "
                               '`lax.conv_transpose` take it (None: their default).'),
    'force_float32_reductions': ('whether the mean and variance are computed in float32 '
                                 'whatever the input dtype.'),
    'force_fp32_for_softmax': ('whether the softmax of the attention weights is computed '
                               'in float32, for mixed-precision training.'),
    'amax_history_length': 'the number of past absolute maxima kept for each scale.',
    'e4m3_dtype': 'the fp8 dtype of the inputs and the kernel.',
    'e5m2_dtype': 'the fp8 dtype of the output gradient.',
    'carry_init': 'initializer of the carry `initialize_carry` returns.',
}


class Field(NamedTuple):
  """One constructor parameter and its line in the ``Fields:`` table."""
  parameter: griffe.Parameter
  description: str


class ConstructorsExtension(griffe.Extension):
  """Gives each dataclass or NamedTuple of the packages its constructor (see the module)."""

  def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
    """Runs on `lift` and `linen_ext` once griffe has read them."""
    if pkg.name not in PACKAGES:
      return
    for function in functions(pkg):
      spell_out_constant_defaults(function)
    for cls in public_classes(pkg):
      runtime = runtime_object(cls)
      if not isinstance(runtime, type):
        continue
      if is_record(runtime) and not has_written_init(cls):
        add_constructor(cls, runtime)
      link_flax(cls, runtime)


def public_classes(obj: griffe.Module | griffe.Class) -> Iterator[griffe.Class]:
  """The classes under ``obj`` (nested ones too) on no private path; aliases skipped."""
  for name, member in obj.members.items():
    if member.is_alias or name.startswith('_'):
      continue
    if isinstance(member, griffe.Class):
      yield member
    if isinstance(member, griffe.Module | griffe.Class):
      yield from public_classes(member)


def functions(obj: griffe.Module | griffe.Class) -> Iterator[griffe.Function]:
  """The functions and methods defined under ``obj`` (nested ones too); aliases skipped."""
  for member in obj.members.values():
    if member.is_alias:
      continue
    if isinstance(member, griffe.Function):
      yield member
    elif isinstance(member, griffe.Module | griffe.Class):
      yield from functions(member)


def spell_out_constant_defaults(function: griffe.Function) -> None:
  """Replaces each default that names a module-level constant of the function's module
  (defined there or imported into it) holding a literal (a tuple of names, a number) by
  the literal, as written where it is defined."""
  for parameter in function.parameters:
    default = parameter.default
    if not isinstance(default, griffe.ExprName):
      continue
    constant = function.module.members.get(default.name)
    if constant is not None and constant.is_alias:
      try:
        constant = constant.final_target
      except griffe.AliasResolutionError:
        continue
    if (constant is None or not isinstance(constant, griffe.Attribute)
        or constant.value is None):
      continue
    try:
      ast.literal_eval(str(constant.value))
    except (ValueError, SyntaxError):
      continue  # a call, a function, a sentinel: its name says more than its value
    parameter.default = constant.value


def runtime_object(cls: griffe.Class) -> Any:
  """The class ``cls`` describes, imported; None where the import does not define it."""
  module = importlib.import_module(cls.module.path)
  obj: Any = module
  for part in cls.path[len(cls.module.path) + 1:].split('.'):
    obj = getattr(obj, part, None)
  return obj


def is_record(runtime: type) -> bool:
  """A dataclass or a NamedTuple: its constructor takes its fields."""
  return dataclasses.is_dataclass(runtime) or (issubclass(runtime, tuple)
                                               and hasattr(runtime, '_fields'))


def has_written_init(cls: griffe.Class) -> bool:
  """Whether the source defines ``__init__`` (griffe's dataclass one has no line)."""
  init = cls.members.get('__init__')
  return init is not None and not init.is_alias and bool(init.lineno)


def add_constructor(cls: griffe.Class, runtime: type) -> None:
  """Sets ``cls.__init__`` to the runtime signature, documented by a table of the fields."""
  described = descriptions(cls, runtime)
  fields = [field(cls, runtime, parameter, described)
            for parameter in signature_order(runtime)]
  self_parameter = griffe.Parameter('self', kind=griffe.ParameterKind.positional_or_keyword)
  cls.set_member('__init__', griffe.Function(
      '__init__', lineno=0, endlineno=0, parent=cls, returns='None',
      parameters=griffe.Parameters(self_parameter, *(f.parameter for f in fields))))
  drop_documented_attributes(cls, {f.parameter.name for f in fields})
  rows = [griffe.DocstringParameter(f.parameter.name,
                                    description=FLAX_MENTION.sub(_flax_link, f.description),
                                    annotation=f.parameter.annotation,
                                    value=f.parameter.default) for f in fields]
  parsed = cls.docstring.parsed if cls.docstring else []
  examples = [i for i, s in enumerate(parsed) if s.kind is griffe.DocstringSectionKind.examples]
  parsed.insert(examples[0] if examples else len(parsed),
                griffe.DocstringSectionParameters(rows, title='Fields:'))


def signature_order(runtime: type) -> list[inspect.Parameter]:
  """The constructor's parameters, ``parent`` and ``name`` last (keyword-only, as
  `Module` makes them, and so in any order) as Flax shows them."""
  parameters = list(inspect.signature(runtime).parameters.values())
  last = [p for p in parameters if p.name in ('parent', 'name')
          and p.kind is inspect.Parameter.KEYWORD_ONLY]
  return [p for p in parameters if p not in last] + last


def field(cls: griffe.Class, runtime: type, parameter: inspect.Parameter,
          described: dict[str, str]) -> Field:
  """The parameter of one field: its type and default from the first source declaring it."""
  annotation, default = (static_field(cls, parameter.name)
                         or flax_field(getattr(runtime, 'flax_class', None), parameter.name)
                         or runtime_field(parameter))
  kind = griffe.ParameterKind[parameter.kind.name.lower()]
  return Field(griffe.Parameter(parameter.name, annotation=annotation, kind=kind,
                                default=default),
               described.get(parameter.name, ''))


def static_field(cls: griffe.Class, name: str) -> tuple[Any, Any] | None:
  """``(annotation, default)`` of ``name`` as the class or a base of ours declares it."""
  for klass in [cls, *griffe_mro(cls)]:
    member = klass.members.get(name)
    if member is not None and not member.is_alias and isinstance(member, griffe.Attribute):
      if member.annotation is not None:
        return member.annotation, static_default(member.value)
  return None


def static_default(value: Any) -> Any:
  """The default of a field: ``field(default=x)`` is ``x``, ``field(default_factory=f)``
  is ``f()``; None for a field without one."""
  if isinstance(value, griffe.ExprCall) and value.canonical_path == 'dataclasses.field':
    keywords = {arg.name: arg.value for arg in value.arguments
                if isinstance(arg, griffe.ExprKeyword)}
    if 'default_factory' in keywords:
      return f'{keywords["default_factory"]}()'
    return keywords.get('default')
  return value


def flax_field(flax_class: type | None, name: str) -> tuple[str, str | None] | None:
  """``(annotation, default)`` of ``name`` as the source of the Flax layer spells them."""
  for klass in flax_class.__mro__ if flax_class else ():
    for node in getattr(flax_class_node(klass), 'body', ()):
      if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
          and node.target.id == name):
        return ast.unparse(node.annotation), ast_default(node.value)
  return None


def flax_class_node(klass: type) -> ast.ClassDef | None:
  """The definition of a module-level class of an installed package, parsed."""
  for node in module_tree(klass.__module__).body:
    if isinstance(node, ast.ClassDef) and node.name == klass.__qualname__:
      return node
  return None


@functools.cache
def module_tree(module: str) -> ast.Module:
  """The parsed source of an imported module."""
  return ast.parse(inspect.getsource(sys.modules[module]))


def ast_default(value: ast.expr | None) -> str | None:
  """A default as written, with ``field(default=x)`` read as ``x``, as `static_default`."""
  if (isinstance(value, ast.Call) and ast.unparse(value.func).split('.')[-1] == 'field'):
    keywords = {k.arg: ast.unparse(k.value) for k in value.keywords}
    if 'default_factory' in keywords:
      return f'{keywords["default_factory"]}()'
    return keywords.get('default')
  return None if value is None else ast.unparse(value)


def runtime_field(parameter: inspect.Parameter) -> tuple[str | None, str | None]:
  """``(annotation, default)`` of a parameter no source declares: the runtime's."""
  empty = inspect.Parameter.empty
  return (None if parameter.annotation is empty else inspect.formatannotation(
              parameter.annotation),
          None if parameter.default is empty else repr(parameter.default))


def griffe_mro(cls: griffe.Class) -> list[griffe.Class]:
  """The bases griffe resolves, nearest first; none where a base is out of its reach."""
  try:
    return cls.mro()
  except (ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
    return []


def descriptions(cls: griffe.Class, runtime: type) -> dict[str, str]:
  """Each field's line: from the class's docstring, a base's, then the Flax layer's."""
  found: dict[str, str] = {}
  flax_class = flax_counterpart(runtime)
  flax_classes = list(flax_class.__mro__) if flax_class else []
  ours = [cls, *griffe_mro(cls)]
  sections = [s for klass in ours if klass.docstring for s in klass.docstring.parsed]
  sections += [s for klass in flax_classes for s in flax_sections(klass)]
  if flax_class:
    sections += [s for klass in native_flax_classes() for s in flax_sections(klass)]
  for section in sections:
    if section.kind in DOCUMENTED:
      for item in section.value:
        found.setdefault(item.name, item.description)
  for klass in ours:  # a field's own docstring, the string after it
    for name, member in klass.members.items():
      if not member.is_alias and isinstance(member, griffe.Attribute) and member.docstring:
        found.setdefault(name, member.docstring.value)
  return {**FLAX_FIELD_LINES, **found} if flax_class else found


def flax_counterpart(runtime: type) -> type | None:
  """The Flax layer a ready-made layer runs, or the Flax class of the same name that a
  class of `linen_ext` is exported as (``nn.RNN``, ``nn.WeightNorm``)."""
  if hasattr(runtime, 'flax_class'):
    return runtime.flax_class
  name = runtime.__name__
  if getattr(importlib.import_module('linen_ext'), name, None) is not runtime:
    return None
  flax_class = getattr(importlib.import_module('flax.linen'), name, None)
  return flax_class if isinstance(flax_class, type) else None


@functools.cache
def flax_sections(klass: type) -> list[griffe.DocstringSection]:
  """The sections of a Flax class's docstring (Google style, as Flax writes them)."""
  return griffe.parse_google(griffe.Docstring(inspect.cleandoc(klass.__doc__ or '')),
                             warnings=False)


def native_flax_classes() -> list[type]:
  """The Flax layers that have a ready-made counterpart: where a field's line is looked
  up when its own layer's docstring has none (``features`` of ``OptimizedLSTMCell``)."""
  native = importlib.import_module('linen_ext.layers.native')
  return list(native.NATIVE_COUNTERPARTS)


def drop_documented_attributes(cls: griffe.Class, fields: set[str]) -> None:
  """Removes the fields from the class's own ``Attributes:`` table: the constructor's
  table shows them."""
  if not cls.docstring:
    return
  parsed = cls.docstring.parsed
  for section in list(parsed):
    if section.kind is griffe.DocstringSectionKind.attributes:
      section.value = [item for item in section.value if item.name not in fields]
      if not section.value:
        parsed.remove(section)


def link_flax(cls: griffe.Class, runtime: type) -> None:
  """Links the class's mentions of Flax's documented names; a class of `linen_ext` under
  such a name gets a line linking Flax's page for it if its docstring names it nowhere."""
  if not cls.docstring:
    return
  texts = [s for s in cls.docstring.parsed if s.kind is griffe.DocstringSectionKind.text]
  for section in texts:
    section.value = FLAX_MENTION.sub(_flax_link, section.value)
  name = runtime.__name__
  if (flax_counterpart(runtime) and name in FLAX_URLS and texts
      and not any(FLAX_URLS[name] in s.value for s in texts)):
    texts[0].value += f'\n\nFlax: [`flax.linen.{name}`]({FLAX_URLS[name]}).'


def _flax_link(match: re.Match) -> str:
  url = FLAX_URLS.get(match.group(1))
  return f'[{match.group(0)}]({url})' if url else match.group(0)
