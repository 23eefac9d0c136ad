"""The command line behind ``python -m tvm_ext.tune``: shared options and checks (``cli_options``,
``cli_args``, ``cli_checks``, ``cli_parse``), each operator's arguments (``operator_cli``), the
``model`` and ``mixed-precision`` subcommands (``model_cli``, ``mp_cli``) and stopping a run
(``interrupts``)."""
