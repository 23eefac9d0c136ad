"""Mixed precision (method 003): the precision parameters and dtype helpers every part reads
(``precision``), the search under an error bound (``mixed_precision``) and the chosen program
written out as code (``codegen``)."""
