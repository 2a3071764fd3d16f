"""Running a scenario: set-up, the round, the loop, its observers, pre-flight checks."""
