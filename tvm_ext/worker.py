"""``python -m tvm_ext.worker``: the command that starts a measuring RPC server on one device
(the server itself: ``tvm_ext.remote.worker``)."""
import sys

if __name__ == "__main__":
    # a worker measures with TVM, never torch, which TVM's FFI imports whenever it is installed
    # (seconds of the worker's start): kept out of this process
    from tvm_ext.measure.lifetime import keep_torch_out

    keep_torch_out()
    # the server's code runs from its own module, so what TVM pickles to start its server process
    # locally (the server's init function) names tvm_ext.remote.worker, which that process imports
    from tvm_ext.remote.worker import main

    sys.exit(main())
