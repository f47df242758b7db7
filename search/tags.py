"""The MLflow tags that tie a run to its search, its role in it and its Tune trial.

A module of its own so that what only reads a store (export, `searches`, resume's checks, the
baselines' lookups) names them without importing ``triaccel.search.callbacks``, which imports Ray
Tune and, through the trainable, torch: about two seconds of every such command's start."""
TAG_SEARCH, TAG_ROLE, TAG_TRIAL = "triaccel.search", "triaccel.role", "triaccel.trial_id"
TAG_DOMINATED = "triaccel.dominated"  # a baseline stopped as unable to become the reference (search.alone)
NODE_TAG = "triaccel.ray_node_id"  # the Ray node a trial trained on (its last, if a resume moved it)
# a run measured alone on a joined Ray cluster, with every GPU (CPU) of this Ray node held meanwhile (search.cluster)
ALONE_NODE_TAG = "triaccel.alone_on_node"
