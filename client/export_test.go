package client

// MaxMuxedCall is maxMuxedCall, for the external tests.
const MaxMuxedCall = maxMuxedCall
