"""Learner solutions the reference answers never showed the grader: other call styles, new mistakes,
tampering, and code that ends its own process. Each is the text of a solution cell, as a learner would
write it; the tests in ``tests/test_grading_learners.py`` grade them on real ranks."""
