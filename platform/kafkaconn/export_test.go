package kafkaconn

// BrokerTopicDefaults exposes brokerTopicDefaults to the external tests,
// which need platform/itest (itself an importer of this package).
var BrokerTopicDefaults = brokerTopicDefaults
