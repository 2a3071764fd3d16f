"""seededapp: a small, seeded Flower app for mecsim's tests."""
