"""The grader's answer keys and known-wrong solutions: test material, kept out of the installed package so
that a learner's ``pip install`` holds no answers."""
