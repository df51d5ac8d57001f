"""The hierarchical device placer (Mirhoseini, Goldie et al., ICLR 2018): a feed-forward grouper assigns
each colocation group (atom) to one of G groups, the 2017 seq2seq placer puts the groups on devices, and
both are trained jointly with REINFORCE. ``policy.HierarchicalPolicy`` is the registry entry."""
