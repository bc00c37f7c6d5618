"""The method replacements `ast.replace_method` knows by the original's qualified name (its
LIBRARY): one module per library whose methods they replace."""
