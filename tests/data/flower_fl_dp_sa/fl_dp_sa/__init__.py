# Copyright Flower Labs GmbH. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Copied from Flower's examples/fl-dp-sa
# (github.com/adap/flower, commit e818710190b2debe2aa63840298cb662df4d6945) for mecsim's
# tests; unchanged.
"""fl_dp_sa: Flower Example using Differential Privacy and Secure Aggregation."""
