# Copyright Flower Labs GmbH. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0). Copied from Flower's examples/custom-mods
# (github.com/adap/flower, commit fdef7afb1dca3030553be302366cfd285ed6632c) for mecsim's
# tests; changed: nothing.
"""custom_mods: A Flower app with custom mods."""
