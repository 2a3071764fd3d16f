"""classicapp: the seeded test app in Flower's classic API."""
