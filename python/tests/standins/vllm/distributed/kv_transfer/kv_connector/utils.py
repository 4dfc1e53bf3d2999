"""Stand-in of vllm/distributed/kv_transfer/kv_connector/utils.py: the part of
KVOutputAggregator that merges the workers' KV events, as ENGINES.md 7.4
says vLLM does it."""


class KVOutputAggregator:
    """Merges the TP workers' kv_connector_output.kv_cache_events."""

    @staticmethod
    def aggregate_events(worker_events):
        """The first worker's object is the accumulator; each further worker
        with events is added to it. Returns the accumulator (or None)."""
        combined = None
        for theirs in worker_events:
            if theirs is None:
                continue
            if combined is None:
                combined = theirs
                continue
            assert isinstance(combined, type(theirs))
            combined.add_events(theirs.get_all_events())
            combined.increment_workers(1)
        return combined
