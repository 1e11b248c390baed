"""placeholder"""
def fleet_trace(run_dir, launch):
    return {}
def print_trace(trace, mode, seed):
    print(trace)
