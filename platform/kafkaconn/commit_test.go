package kafkaconn

import (
	"errors"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// From OffsetCommit v10 (Kafka 4) a refusal names the topic by id only;
// the error must still name the topic, taken from the request, as the
// aggregator's and the alerter's logs and the operator rely on it. (The
// broker test sees v10 only when the client already knew the topic's id:
// it failed in one CI run out of several.)
func TestCommitRefusalNamesTopicByIDFromTheRequest(t *testing.T) {
	id := [16]byte{1, 2, 3}
	req := kmsg.NewPtrOffsetCommitRequest()
	req.Topics = []kmsg.OffsetCommitRequestTopic{{Topic: "other", TopicID: [16]byte{9}}, {Topic: "usage_topic", TopicID: id}}
	resp := kmsg.NewPtrOffsetCommitResponse()
	resp.Version = 10
	resp.Topics = []kmsg.OffsetCommitResponseTopic{{TopicID: id, Partitions: []kmsg.OffsetCommitResponseTopicPartition{
		{Partition: 3, ErrorCode: kerr.UnknownTopicOrPartition.Code}}}}
	err := commitError(req, resp, nil)
	if !errors.Is(err, kerr.UnknownTopicOrPartition) || !strings.Contains(err.Error(), "usage_topic/3") {
		t.Fatalf("err = %v, want UNKNOWN_TOPIC_OR_PARTITION naming usage_topic/3", err)
	}
	// An id the request does not hold is shown as the id.
	resp.Topics[0].TopicID = [16]byte{7}
	if err := commitError(req, resp, nil); err == nil || !strings.Contains(err.Error(), "topic id 07") {
		t.Fatalf("err = %v, want the unknown id shown", err)
	}
}
