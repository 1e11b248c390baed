"""A verl ``compute_score`` that records how it was called (tests/learner/test_data_formats.py)."""

CALLS: list[dict] = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    CALLS.append({"data_source": data_source, "solution_str": solution_str, "ground_truth": ground_truth,
                  "extra_info": extra_info})
    return 1.0 if solution_str.strip() == str(ground_truth) else 0.0
