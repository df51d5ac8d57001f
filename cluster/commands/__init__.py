"""One module per `placer` subcommand; each exposes ``register(subparsers)``.

Modules import heavy libraries (torch, TensorFlow, Ray) inside their handlers, never at the top, so
`placer --help` stays fast.
"""

COMMAND_MODULES = [
    # "cluster.commands.graphs",  # placer graphs list|show|export|import
]
