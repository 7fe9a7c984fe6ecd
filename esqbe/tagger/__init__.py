"""The facet tagger: network, weights, runtime, training, evaluation, file tagging."""
