"""Reading a compiled pipeline spec in tests."""

from kfp.pipeline_spec import pipeline_spec_pb2


def pipeline_tasks(spec: pipeline_spec_pb2.PipelineSpec) -> dict:
    """Every container task, those inside control-flow groups (``dsl.If``) included: name -> (its task spec, the
    task spec of the group it is in, or None)."""
    found, groups = {}, [(spec.root.dag, None)]
    while groups:
        dag, group = groups.pop()
        for name, task in dag.tasks.items():
            component = spec.components[task.component_ref.name]
            if component.WhichOneof("implementation") == "dag":
                groups.append((component.dag, task))
            else:
                found[name] = (task, group)
    return found
