package auth

// ConnectRateBuckets is the bucket count of the per-address connect-rate
// window: the broker's table uses it, and the configuration validates
// mqtt.connect_rate against it.
const ConnectRateBuckets = 10
