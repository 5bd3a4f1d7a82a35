"""What the tests share: a real server subprocess, clients and helpers of their own.

Test modules import helpers from here, never from one another (tests/unit/test_test_layout.py
checks it), so a helper has one home and moving or deleting a test module breaks no other.
"""
