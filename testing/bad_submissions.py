"""Submission field values the MLPerf rules refuse, for tests.

`rules.validate_submission` must refuse each one with an error naming the
config field and the value; `rules_test` checks that on the rules themselves,
`logger_test` on `logger.create_mllogger`, which must refuse them before it
creates a file. One table, so both doors are tried with the same values.
"""

# (test name, config field, a value the rules refuse), for
# `parameterized.named_parameters`.
CASES = (
    ("ruleset", "mllog_ruleset", "5.9.0"),
    ("division", "submission_division", "Open"),
    ("status", "submission_status", "onpremise"),
    ("benchmark", "submission_benchmark", "llama3_8b"),
    ("empty_org", "submission_org", ""),
    ("blank_platform", "submission_platform", "  "),
)
