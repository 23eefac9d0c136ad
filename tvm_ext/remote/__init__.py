"""Measuring on other devices and hosts: the RPC runner (``rpc_runner``), the measuring server
behind ``python -m tvm_ext.worker`` (``worker``), a local tracker and workers for ``--devices``
(``cluster``), and what crosses the network (``wire``: the frame, ``messages``: its contents)."""
