"""The recipe's sections as pydantic models, in one place: every key a recipe may set.

- `base`: what every section shares (Strict: unknown keys refused; located errors),
- `signatures`: a model input's signature (source.inputs: name, shape, dtype, batch axis),
- `sections`: datasets, quantization, verify, diff, export, optimize, precheck,
- `source`: the source kinds (pytorch, onnx, tensorflow, jax) and the conversion path.

edgeflow.recipe.schema composes them into the Recipe with the target profile and the resolved
rules (a floor above: it needs the targets and the rules), and edgeflow.recipe.checks checks
across sections. docs/recipe.md documents every key.
"""
