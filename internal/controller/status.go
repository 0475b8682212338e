package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
)

var metav1UpdateOptions = metav1.UpdateOptions{FieldManager: FieldManager}

// setReady sets the Ready condition; it reports whether anything changed.
func setReady(conds *[]metav1.Condition, generation int64, ready bool, reason, format string, args ...any) bool {
	status := metav1.ConditionFalse
	if ready {
		status = metav1.ConditionTrue
	}
	return meta.SetStatusCondition(conds, metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             status,
		ObservedGeneration: generation,
		Reason:             reason,
		Message:            fmt.Sprintf(format, args...),
	})
}
