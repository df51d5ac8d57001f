"""One module per `placer` subcommand; each exposes ``register(subparsers)``.

Modules import heavy libraries (torch, TensorFlow, Ray) inside their handlers, never at the top, so
`placer --help` stays fast.
"""

COMMAND_MODULES = [
    "cluster.commands.analyze",  # placer analyze
    "cluster.commands.apply",  # placer apply
    "cluster.commands.baselines",  # placer baselines
    "cluster.commands.bound",  # placer bound
    "cluster.commands.graphs",  # placer graphs list|show|export|import
    "cluster.commands.machines",  # placer machines list|show
    "cluster.commands.measure",  # placer measure
    "cluster.commands.profile",  # placer profile
    "cluster.commands.reproduce",  # placer reproduce
    "cluster.commands.search",  # placer search
    "cluster.commands.simulate",  # placer simulate
    "cluster.commands.train",  # placer train
]
